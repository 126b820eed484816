package kgohooks

// Static members (kgo.InstanceID).
//
// An image carries the instance id, and every copy restored from it would
// join under it: clones fence each other (FENCED_INSTANCE_ID, or
// UNRELEASED_INSTANCE_ID with KIP-848), and a copy of a --leave-running
// image takes the original's membership. So on every restore the instance
// id becomes base + "-" + the first 8 hex digits of the instance id
// (notify.Event.ShortID), like the client id; a resume keeps it.
//
// kgo never removes a static member from its group: it sends no LeaveGroup
// for a classic one, and a KIP-848 one leaves with member epoch -2, which
// keeps its partitions reserved until the session timeout or until a member
// with the same instance id joins. (kgo v1.22.3 even sends that -2 without
// the instance id, which Kafka 4.3 refuses: INVALID_REQUEST "InstanceId
// can't be null".) No copy comes back under that instance id, so the
// checkpoint removes the member itself (leaveMember), whatever kgo's leave
// returned, and the other members take its partitions at once, as they do
// for a dynamic one.

// restoredInstanceID returns the instance id of a copy restored with short
// (notify.Event.ShortID), or "" for a dynamic member.
func (c *core) restoredInstanceID(short string) string {
	if c.baseInstanceID == "" {
		return ""
	}
	return c.baseInstanceID + "-" + short
}

// InstanceID returns the group instance id (kgo.InstanceID) of the current
// kgo client: the configured one, suffixed after a restore; "" for a
// dynamic member.
func (c *core) InstanceID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.instanceID
}
