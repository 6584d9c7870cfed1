#!/usr/bin/env bash
# Run benchmarks 1-5 of bench/README.md in one go (about 10-15 minutes on 2 cores) and keep their output in
# bench/results/run_all.log. The estimator runs with --quick here (small inputs); its full table takes
# `python bench/bench_estimator.py` on its own (10-20 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
log=bench/results/run_all.log
: > "$log"
run() {
    echo "== $*" | tee -a "$log"
    local start=$SECONDS
    python "$@" 2>&1 | tee -a "$log"
    echo "($((SECONDS - start)) s)" | tee -a "$log"
}
run bench/bench_estimator.py --quick
run bench/bench_fit.py
run bench/bench_allocate.py --repeat 3
run bench/bench_plan_quality.py
run bench/bench_e2e.py
run bench/bench_search_cost.py
run bench/bench_rebalance.py
run bench/bench_comm.py
run bench/bench_advise.py
echo "all benchmarks done in ${SECONDS} s; figures in bench/results/" | tee -a "$log"
