"""When the node plays a role: round mode's token (rounds), async mode's volunteering (async_mode), each given the parts
it drives through a SchedulerPort (ports)."""
