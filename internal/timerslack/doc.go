// Package timerslack widens the kernel's timer slack of every thread of a
// short-lived process, so that the Go runtime's background monitor (sysmon) stops
// waking every few tens of microseconds.
//
// sysmon sleeps 20 us between its checks for the first thousand or so of them,
// and starts over whenever it takes a processor back from a blocking system call.
// In a process that lives a few milliseconds, such as the CNI plugin, that is 50
// to 100 wake-ups per run (each a timer interrupt and two context switches, more
// in a virtual machine), a fifth of the process's CPU time, spent on the core the
// API server or the other pods starting beside it need. A timer slack lets the
// kernel fire a thread's timers up to that much late and batch them: with a few
// milliseconds, sysmon wakes two or three times per run.
//
// The slack delays every timed wait of the process by at most that much: the
// plugin's lookup retry interval (1 s by default), a deadline of seconds,
// sysmon's own preemption of a goroutine that runs for over 10 ms. Child
// processes inherit the slack of the thread that starts them.
package timerslack
