// Package natsmetrics counts what a Fleetstream process sees of NATS: its connection lost and
// regained, event appends published again after a lost answer, and ordered readers whose
// consumer had to be made again. The counters are the process's (every connection, store and
// reader in it counts into them), registered on each server registry the process serves
// (Collectors); a process that serves no metrics (the agent) counts into nothing read.
package natsmetrics

import (
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	disconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetstream_nats_disconnects_total",
		Help: "Times a NATS connection of this process lost its server (each is followed by reconnect attempts)."})
	reconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetstream_nats_reconnects_total",
		Help: "Times a NATS connection of this process connected again after losing its server."})
	publishRetries = prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetstream_nats_publish_retries_total",
		Help: "Event appends published again because the answer to the last attempt was lost (timeout, no responders, reconnecting); the event id makes a retry safe."})
	consumerRecreations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetstream_nats_consumer_recreations_total",
		Help: "Ordered readers (views, feeds) whose consumer was lost (deleted, its node gone, heartbeats missed) and made again from the next sequence, by stream."},
		[]string{"stream"})
)

// Collectors are the process's NATS counters, for its server's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{disconnects, reconnects, publishRetries, consumerRecreations}
}

// ConnectionOptions count a connection's disconnects and reconnects, after calling the
// handlers given (nil: none), which they replace: pass every handler of the connection here.
func ConnectionOptions(onDisconnect nats.ConnErrHandler, onReconnect nats.ConnHandler) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			disconnects.Inc()
			if onDisconnect != nil {
				onDisconnect(nc, err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			reconnects.Inc()
			if onReconnect != nil {
				onReconnect(nc)
			}
		}),
	}
}

// PublishRetried counts one publish sent again.
func PublishRetried() { publishRetries.Inc() }

// ConsumerRecreated counts an ordered reader of stream making its consumer again. stream is a
// stream of Fleetstream's topology (FLEET_*, KV_*), never a name from user input.
func ConsumerRecreated(stream string) { consumerRecreations.WithLabelValues(stream).Inc() }
