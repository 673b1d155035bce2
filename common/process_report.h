// How a child process ended, in words a person reads: for the launcher and the benchmark, which both start
// daemons and name the one that failed with the end of its log.
#ifndef TESSERA_COMMON_PROCESS_REPORT_H_
#define TESSERA_COMMON_PROCESS_REPORT_H_

#include <string>

namespace tessera {

// "exit code 1", "signal 9", from a waitpid() status.
std::string ExitStatusText(int wait_status);

// The last `lines` lines of a text file, joined by newlines ("" when unreadable).
std::string TailOfFile(const std::string& path, int lines);

}  // namespace tessera

#endif  // TESSERA_COMMON_PROCESS_REPORT_H_
