// How parameterised tests print their parameters. gtest lists each test with its parameter beside its name, and
// ctest shows that line: the job's enums print as their names, not as numbers or bytes. A test's own parameter
// struct gets a PrintTo beside it.
#ifndef TESSERA_TESTS_TESTING_PARAM_PRINTERS_H_
#define TESSERA_TESTS_TESTING_PARAM_PRINTERS_H_

#include <ostream>

#include "proto/job.pb.h"

namespace tessera::v1 {

inline void PrintTo(ConsistencySpec::Mode mode, std::ostream* os) { *os << ConsistencySpec::Mode_Name(mode); }
inline void PrintTo(OptimizerSpec::Kind kind, std::ostream* os) { *os << OptimizerSpec::Kind_Name(kind); }
inline void PrintTo(WireSpec::Precision precision, std::ostream* os) { *os << WireSpec::Precision_Name(precision); }
inline void PrintTo(Transport transport, std::ostream* os) { *os << Transport_Name(transport); }

}  // namespace tessera::v1

#endif  // TESSERA_TESTS_TESTING_PARAM_PRINTERS_H_
