// Start-up shared by every Tessera binary: flags, logging, signals, and the process-wide Abseil settings.
#ifndef TESSERA_COMMON_DAEMON_INIT_H_
#define TESSERA_COMMON_DAEMON_INIT_H_

namespace tessera {

// Parses the program's flags (ParseProgramFlags in common/command_line.h: --help, --version, TESSERA_* variables,
// own flags being those of the binary's *_main.cc), logs to stderr, catches SIGINT/SIGTERM (a signal exits at
// once until the daemon gives WatchTerminationSignals its stop handler), and turns off Abseil's mutex deadlock
// detection: Debian's Abseil is built with it on, and its lock graph grows with every short-lived mutex, slowing
// a long run down step after step.
// Raises the open-descriptor limit to its hard limit, ignores SIGPIPE, and calls KeepTransientBuffersMapped. Call first in main, before any thread starts.
void InitDaemon(const char* usage, int* argc, char*** argv);

// Process-wide malloc settings for the data plane: freed message buffers stay mapped for reuse (up to 64 MiB)
// instead of being returned to the kernel and faulted in again on the next call. Call before threads start.
void KeepTransientBuffersMapped();

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_INIT_H_
