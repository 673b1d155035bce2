// Section s of tessera-bench: embedding tables' rows (see tests/bench/row_bench.cc).
#ifndef TESSERA_TESTS_BENCH_ROW_BENCH_H_
#define TESSERA_TESTS_BENCH_ROW_BENCH_H_

#include "tests/bench/bench_cluster.h"

namespace tessera::bench {

// Adds section s's rows to `table`.
void RowSection(const Context& ctx, Table& table);

}  // namespace tessera::bench

#endif  // TESSERA_TESTS_BENCH_ROW_BENCH_H_
