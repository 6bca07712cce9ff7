package agent

import (
	"fmt"
	"time"
)

// Two agents on one node (two releases of the chart with different ports) that
// disagree on the kubeconfig (their tokens differ) or on the entry (their settings
// differ) each put back what the other wrote, as fast as the watch reports the
// other's write: thousands of writes a second, each an fsync. What either wrote
// works for the plugin, so the agent stops answering at once: after contestFree
// overwrites of another writer's content within contestWindow, it overwrites at most
// once per delay, from retryMin doubling to retryMax, until a contestWindow passes
// without another writer's content in the file. A file that lost its content
// (deleted, or the primary CNI dropped the entry) is never such an overwrite: that is
// put back at once, as ever.
const (
	contestWindow = time.Minute
	contestFree   = 5
	contestHint   = "is a second istio-cni agent (another Helm release) running on this node? Until it stops, this agent rewrites the file at most once per retry, from 1s doubling to 30s"
)

// contest is the record of one file's overwrites of another writer's content.
type contest struct {
	overwrites []time.Time // before the contest: the last ones, at most contestFree
	lastSeen   time.Time   // another writer's content was last found
	delay      time.Duration
	next       time.Time // no overwrite before, while contested
}

// mayOverwrite decides whether the agent may now replace another writer's content
// of the file at path, and records the overwrite when it may. When it may not, it
// counts the deferral; the caller asks for a retry. A contest is reported once.
func (a *agent) mayOverwrite(path string, now time.Time) bool {
	for p, c := range a.contests {
		if p != path && now.Sub(c.lastSeen) >= contestWindow {
			a.endContest(p)
		}
	}
	c := a.contests[path]
	if c == nil || now.Sub(c.lastSeen) >= contestWindow {
		if c != nil {
			a.endContest(path)
		}
		c = &contest{}
		a.contests[path] = c
		a.clearReport("contest:" + path)
	}
	c.lastSeen = now
	if c.delay == 0 {
		kept := c.overwrites[:0]
		for _, t := range c.overwrites {
			if now.Sub(t) < contestWindow {
				kept = append(kept, t)
			}
		}
		c.overwrites = kept
		if len(c.overwrites) < contestFree {
			c.overwrites = append(c.overwrites, now)
			return true
		}
		c.overwrites = nil
	}
	a.report("contest:"+path, fmt.Errorf("another writer keeps changing %s: %d times within %s this agent found content it did not write and put its own back",
		path, contestFree, contestWindow), contestHint)
	if now.Before(c.next) {
		a.m.contestDeferrals.Inc()
		return false
	}
	c.delay = min(max(2*c.delay, retryMin), retryMax)
	c.next = now.Add(c.delay)
	return true
}

// endContest forgets the contest over path, and says it is over when it was
// reported: the error would otherwise be the log's last word on the file.
func (a *agent) endContest(path string) {
	delete(a.contests, path)
	if _, ok := a.reported["contest:"+path]; ok {
		a.log.Info("another writer no longer changes the file", "file", path, "quietFor", contestWindow)
	}
	a.clearReport("contest:" + path)
}

// endContests ends the contests whose other writer was last seen contestWindow
// ago, and wakes the loop when the next reported one may end: this agent's own
// content in place raises no event that would. One wake is pending at a time.
func (a *agent) endContests(now time.Time) {
	var next time.Time
	for p, c := range a.contests {
		end := c.lastSeen.Add(contestWindow)
		if !now.Before(end) {
			a.endContest(p)
			continue
		}
		if _, ok := a.reported["contest:"+p]; ok && (next.IsZero() || end.Before(next)) {
			next = end
		}
	}
	if next.IsZero() || a.contestWake.After(now) {
		return
	}
	a.contestWake = next
	time.AfterFunc(next.Sub(now), func() {
		select {
		case a.recheck <- struct{}{}:
		default:
		}
	})
}

// contested says a contest over path has been reported: its put-backs, one per
// retry for as long as the other writer runs, are not logged one by one.
func (a *agent) contested(path string) bool {
	_, ok := a.reported["contest:"+path]
	return ok
}
