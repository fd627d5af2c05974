package agent

// NodeEvents returns how many node events the agent's informer has delivered, how many of
// them its resource sums are final for (nodeResources.settled), and how many times the sums
// changed (each change wakes the heartbeater): a test waits on these before asserting that an
// event sent nothing.
func (a *Agent) NodeEvents() (seen, settled, changes uint64) {
	r := a.resources
	settled = r.settled()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen, settled, r.changes
}
