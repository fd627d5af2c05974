package consumer

// OrderedConsumerName returns the name of o's current server-side consumer ("" between two).
func OrderedConsumerName(o *Ordered) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cons == nil {
		return ""
	}
	return o.cons.CachedInfo().Name
}

// BreakOrdered stops o's current iterator as the server would close it, which makes o replace
// its consumer.
func BreakOrdered(o *Ordered) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.it != nil {
		o.it.Stop()
	}
}
