"""A launch over several machines: torch's elastic agent, its rendezvous, the nodes'
addresses and this node's events."""
