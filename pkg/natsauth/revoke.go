package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Revocation reaches open connections by closing them: an admitted connection keeps the
// permissions it was admitted with until it ends, so refusing a revoked token only at the next
// connect would leave a deregistered cluster's agent or a deleted subscriber connected (for as
// long as the callout's user JWT lives). Every server reports a connection under the user name
// its identity got (Identity.User, which names the instance, so a cluster registered again under
// the same name is a different user), and a Kicker closes that user's connections on every
// server. The client then reconnects and is refused, its token being gone.

// Kicker closes every open connection of a NATS user, on every server of the NATS cluster.
type Kicker interface {
	// Kick closes the connections of user and returns how many it closed.
	Kick(ctx context.Context, user string) (int, error)
}

// ServerKicker kicks on one in-process server: fleetd's embedded single node.
type ServerKicker struct{ Server *server.Server }

// Kick implements Kicker.
func (k ServerKicker) Kick(ctx context.Context, user string) (int, error) {
	if user == "" {
		return 0, errors.New("kick: no user")
	}
	// A page at a time until no new one is listed: the kicked ones leave the open list, though
	// not necessarily before the next page is asked for.
	kicked := map[uint64]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return len(kicked), err
		}
		cz, err := k.Server.Connz(&server.ConnzOptions{User: user, State: server.ConnOpen, Limit: 1024})
		if err != nil {
			return len(kicked), fmt.Errorf("kick %s: list connections: %w", user, err)
		}
		more := false
		for _, c := range cz.Conns {
			if kicked[c.Cid] {
				continue
			}
			more = true
			if k.Server.DisconnectClientByID(c.Cid) == nil {
				kicked[c.Cid] = true
			}
		}
		if !more {
			return len(kicked), nil
		}
	}
}

// System requests of nats-server (server/events.go): every server answers the PING one, each
// server its own KICK.
const (
	connzPingSubject   = "$SYS.REQ.SERVER.PING.CONNZ"
	kickSubjectPattern = "$SYS.REQ.SERVER.%s.KICK"
)

// SystemUser is the system account user of a NATS cluster's configuration (deploy/nats/auth.conf)
// that cluster-import kicks with (--nats-system-user).
const SystemUser = "cluster-import-system"

// SystemPermissions is all a SystemKicker's system account user needs, its connection's reply
// subjects under ServiceInboxPrefix(SystemUser) as daemon.ConnectAs makes them.
func SystemPermissions() Permissions {
	return Permissions{
		Publish:   []string{connzPingSubject, fmt.Sprintf(kickSubjectPattern, "*")},
		Subscribe: []string{ServiceInboxPrefix(SystemUser) + ".>"},
	}
}

// SystemKicker kicks on every server of a NATS cluster through a connection of a user of its
// system account (SystemPermissions suffice): it asks every server for the user's connections
// ($SYS.REQ.SERVER.PING.CONNZ, answered by each server of the cluster) and each server that has
// some to close them ($SYS.REQ.SERVER.<id>.KICK).
type SystemKicker struct {
	Conn *nats.Conn
	// Gather is how long the answers of the servers are collected; 0 means 250 ms. A server that
	// answers later keeps its connections until the next Kick (callers repeat it).
	Gather time.Duration
}

// connzReply is a server's answer to CONNZ (server.ServerAPIResponse with Connz data).
type connzReply struct {
	Server struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"server"`
	Data *struct {
		Total int `json:"total"`
		Conns []struct {
			Cid uint64 `json:"cid"`
		} `json:"connections"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// Kick implements Kicker.
func (k *SystemKicker) Kick(ctx context.Context, user string) (int, error) {
	if user == "" {
		return 0, errors.New("kick: no user")
	}
	gather := k.Gather
	if gather <= 0 {
		gather = 250 * time.Millisecond
	}
	inbox := k.Conn.NewRespInbox()
	sub, err := k.Conn.SubscribeSync(inbox)
	if err != nil {
		return 0, fmt.Errorf("kick %s: %w", user, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, _ := json.Marshal(map[string]any{"user": user, "state": server.ConnOpen, "limit": 1 << 16})
	if err := k.Conn.PublishRequest(connzPingSubject, inbox, req); err != nil {
		return 0, fmt.Errorf("kick %s: ask the servers: %w", user, err)
	}
	deadline := time.Now().Add(gather)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var (
		errs    []error
		mu      sync.Mutex
		kicked  int
		wg      sync.WaitGroup
		answers int
	)
	for {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break // the gather window ended (or the connection did)
		}
		answers++
		var r connzReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			errs = append(errs, fmt.Errorf("connz answer: %w", err))
			continue
		}
		if r.Error != nil {
			errs = append(errs, fmt.Errorf("connz of server %s: %s", r.Server.Name, r.Error.Description))
			continue
		}
		if r.Data == nil {
			continue
		}
		for _, c := range r.Data.Conns {
			wg.Add(1)
			go func(serverID, serverName string, cid uint64) {
				defer wg.Done()
				err := k.kick(ctx, serverID, cid)
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, errGone) {
					return // it closed by itself meanwhile
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("kick connection %d on server %s: %w", cid, serverName, err))
					return
				}
				kicked++
			}(r.Server.ID, r.Server.Name, c.Cid)
		}
	}
	wg.Wait()
	if answers == 0 {
		errs = append(errs, errors.New("no server answered (is the connection a system account user?)"))
	}
	if len(errs) > 0 {
		return kicked, fmt.Errorf("kick %s: %w", user, errors.Join(errs...))
	}
	return kicked, nil
}

func (k *SystemKicker) kick(ctx context.Context, serverID string, cid uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	data, _ := json.Marshal(server.KickClientReq{CID: cid})
	msg, err := k.Conn.RequestWithContext(ctx, fmt.Sprintf(kickSubjectPattern, serverID), data)
	if err != nil {
		return err
	}
	var r connzReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return fmt.Errorf("kick answer: %w", err)
	}
	if r.Error != nil {
		if strings.Contains(r.Error.Description, "no such client") {
			return errGone
		}
		return errors.New(r.Error.Description)
	}
	return nil
}

var errGone = errors.New("connection gone")
