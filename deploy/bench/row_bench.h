// Section s of tessera-bench: embedding tables' rows (see deploy/bench/row_bench.cc).
#ifndef TESSERA_DEPLOY_BENCH_ROW_BENCH_H_
#define TESSERA_DEPLOY_BENCH_ROW_BENCH_H_

#include "deploy/bench/bench_cluster.h"

namespace tessera::bench {

// Adds section s's rows to `table`.
void RowSection(const Context& ctx, Table& table);

}  // namespace tessera::bench

#endif  // TESSERA_DEPLOY_BENCH_ROW_BENCH_H_
