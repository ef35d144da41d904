"""A jail's network: the policy, one object per mode, the filtering proxy and slirp4netns."""
