package natsauth

// AdminUser is the static NATS user of the operator's backups and restores (fleetctl admin
// backup and restore) on a NATS cluster. Like cluster-import's, it is a user of the server's
// configuration, not of the auth callout: a restore runs before any service, cluster-import
// (which answers the callout) included.
const AdminUser = "fleetstream-admin"

// AdminPermissions are what a backup and a restore need: JetStream's API on every stream (list,
// info, snapshot, restore, delete), the snapshot's flow-control acknowledgements and the
// restore's chunks ($JS.SNAPSHOT.>), and replies on the user's own inbox prefix. No stream's
// subjects: the user never publishes events or reads them but through a snapshot.
func AdminPermissions() Permissions {
	return Permissions{
		Publish:   []string{"$JS.API.>", "$JS.SNAPSHOT.>"},
		Subscribe: []string{ServiceInboxPrefix(AdminUser) + ".>"},
	}
}
