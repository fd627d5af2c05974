package authz

import (
	"flag"
	"os"
	"strings"
)

// RegisterFlags adds --platform-admins and --platform-admin-groups (comma-separated; the
// environment variables FLEETSTREAM_PLATFORM_ADMINS and FLEETSTREAM_PLATFORM_ADMIN_GROUPS are
// their defaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.PlatformAdmins = splitList(os.Getenv("FLEETSTREAM_PLATFORM_ADMINS"))
	c.PlatformAdminGroups = splitList(os.Getenv("FLEETSTREAM_PLATFORM_ADMIN_GROUPS"))
	fs.Func("platform-admins", "comma-separated users (as the token file or OIDC names them) who may do everything (env FLEETSTREAM_PLATFORM_ADMINS)",
		func(s string) error { c.PlatformAdmins = splitList(s); return nil })
	fs.Func("platform-admin-groups", "comma-separated groups whose members may do everything (env FLEETSTREAM_PLATFORM_ADMIN_GROUPS)",
		func(s string) error { c.PlatformAdminGroups = splitList(s); return nil })
	c.XDSReaders = splitList(os.Getenv("FLEETSTREAM_XDS_READERS"))
	c.XDSReaderGroups = splitList(os.Getenv("FLEETSTREAM_XDS_READER_GROUPS"))
	fs.Func("xds-readers", "comma-separated users with the xds-reader role: they may read the xDS feed of endpoints (--xds-listen) and nothing else (env FLEETSTREAM_XDS_READERS)",
		func(s string) error { c.XDSReaders = splitList(s); return nil })
	fs.Func("xds-reader-groups", "comma-separated groups whose members have the xds-reader role (env FLEETSTREAM_XDS_READER_GROUPS)",
		func(s string) error { c.XDSReaderGroups = splitList(s); return nil })
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ForInsecureDev returns c with the anonymous caller of an unauthenticated (--insecure-dev)
// server made a platform admin: without authentication there is no one else to be.
func (c Config) ForInsecureDev() Config {
	c.PlatformAdmins = append(append([]string{}, c.PlatformAdmins...), Anonymous)
	return c
}
