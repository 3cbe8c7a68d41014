"""A host from the workstation: pushes, the agent and its delivery, operating it, the hosts file."""
