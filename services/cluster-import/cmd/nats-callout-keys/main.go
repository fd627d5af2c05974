// Command nats-callout-keys writes fresh keys for a NATS auth callout answered by cluster-import:
// an account nkey (the issuer signing the answers) and a curve nkey (the xkey encrypting requests
// and answers). Each seed goes to its own file (mode 0600); the public keys, which the NATS
// configuration names, are printed as NATS_CALLOUT_ISSUER=… and NATS_CALLOUT_XKEY=… lines.
//
//	nats-callout-keys <issuer-seed-file> <xkey-seed-file>
package main

import (
	"fmt"
	"os"

	"github.com/nats-io/nkeys"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: nats-callout-keys <issuer-seed-file> <xkey-seed-file>")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "nats-callout-keys:", err)
		os.Exit(1)
	}
}

func run(issuerFile, xkeyFile string) error {
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		return fmt.Errorf("create issuer key: %w", err)
	}
	xkey, err := nkeys.CreateCurveKeys()
	if err != nil {
		return fmt.Errorf("create xkey: %w", err)
	}
	for _, k := range []struct {
		kp   nkeys.KeyPair
		file string
		env  string
	}{{issuer, issuerFile, "NATS_CALLOUT_ISSUER"}, {xkey, xkeyFile, "NATS_CALLOUT_XKEY"}} {
		seed, err := k.kp.Seed()
		if err != nil {
			return err
		}
		if err := os.WriteFile(k.file, append(seed, '\n'), 0o600); err != nil {
			return fmt.Errorf("write seed: %w", err)
		}
		pub, err := k.kp.PublicKey()
		if err != nil {
			return err
		}
		fmt.Printf("%s=%s\n", k.env, pub)
	}
	return nil
}
