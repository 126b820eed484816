// Package criu drives CRIU (Checkpoint/Restore In Userspace) for kcr.
//
// It talks to CRIU through its "swrk" RPC mode with a small client of its own
// (built on go-criu's generated rpc types), because go-criu's high-level
// client loses the restored PID, leaks its socket into concurrently started
// children and crashes on pre-dump.
//
// Entry points:
//
//   - Find, ReadVersion, CheckKernel, KernelRelease, Check: locate and vet the
//     CRIU binary (kcr doctor).
//   - Preflight, ShellJobNeeded: look at a target before dumping it.
//   - Dump, WaitGone: checkpoint a process tree and wait for it to vanish.
//   - ImageTasks, CheckPIDFree, CheckImagePIDsFree: make sure the PIDs and
//     thread IDs an image needs are free.
//   - Restore: bring an image back as a detached process tree.
//   - ReadDumpStats, ReadRestoreStats: CRIU's own timings and page counts.
//
// Failures of Dump and Restore are *Error values carrying the first real
// error line of CRIU's log and, when the cause is recognised, a Cause and a
// hint (see ParseLog). Nothing here prints.
//
// Everything needs root (CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE plus
// CAP_SYS_PTRACE) and CRIU >= 4.2 on kernels >= 6.16.
package criu
