package daemon

import "flag"

// Flags are a service's options as its binary and fleetd both take them: each service's Config
// registers its flags and checks the values given, naming the flag of a bad one.
type Flags interface {
	RegisterFlags(fs *flag.FlagSet)
	Validate() error
}
