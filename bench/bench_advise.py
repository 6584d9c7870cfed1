"""``batchplan advise``'s pruned search against brute force over the same candidates.

Usage: ``python bench/bench_advise.py [--offers FILE] [--model resnet50] [--global-batch N] [--max-gpus 16]
[--repeats 3] [--cache-dir DIR]``. Prints the front of each, then exactly
``advise: offers=8 candidates=N evaluated=M front=K same_as_brute_force=true seconds=S``; writes
bench/results/advise.json.

What runs: the offers file (default ``cluster_configs/offers/example.yaml``, 8 offers on 3 networks) and the
job give one ``AdviseContext`` (profiles estimated once per GPU type, or read from the profile cache); every
candidate of at most ``--max-gpus`` GPUs is enumerated; the brute force plans every one of them
(``search(prune=False)``) and the advise search plans only those its bound does not rule out. The two fronts
are compared point by point (the same clusters, times and costs equal to 1e-12 relative). ``evaluated`` is
the advise search's plans made; ``seconds`` the median wall time of ``--repeats`` advise searches
(profiles already made: the search alone, the part that grows with the offers), interleaved with nothing
else; the machine is shared, so the median of the runs is reported, and each run's time goes to the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _same_front(a, b) -> bool:
    if [p.candidate.label for p in a] != [p.candidate.label for p in b]:
        return False
    return all(
        abs(x.time_per_epoch_s - y.time_per_epoch_s) <= 1e-12 * y.time_per_epoch_s
        and abs(x.cost_per_epoch_usd - y.cost_per_epoch_usd) <= 1e-12 * max(y.cost_per_epoch_usd, 1e-300)
        for x, y in zip(a, b, strict=True)
    )


def main() -> int:
    from planner.advise.candidates import enumerate_candidates
    from planner.advise.evaluate import AdviseContext
    from planner.advise.offers import load_offers
    from planner.advise.search import search
    from planner.job import JobSpec
    from planner.profiles.cache import ProfileCache

    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--offers", default=str(REPO / "cluster_configs" / "offers" / "example.yaml"))
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--max-gpus", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    offers = load_offers(args.offers)
    job = JobSpec(model=args.model, global_batch=args.global_batch)
    start = time.monotonic()
    context = AdviseContext(
        job,
        offers,
        epoch_samples=1_281_167,
        cache=ProfileCache(args.cache_dir),
        on_progress=lambda line: print(line, file=sys.stderr),
    )
    profiles_s = time.monotonic() - start
    usable = [o for o in offers.offers if context.holds_job(o) is None]
    candidates = enumerate_candidates(offers, usable, max_gpus=args.max_gpus)
    runs = [search(context, candidates) for _ in range(max(1, args.repeats))]
    pruned = runs[0]
    brute = search(context, candidates, prune=False)
    same = _same_front(pruned.front, brute.front) and all(_same_front(r.front, pruned.front) for r in runs)
    bound_ok = all(e.samples_per_s <= e.bound_samples_per_s for e in brute.evaluated)
    seconds = statistics.median(r.seconds for r in runs)
    for name, result in (("advise", pruned), ("brute force", brute)):
        print(f"{name}: planned {result.planned} of {result.candidates} in {result.seconds:.2f} s")
        for p in result.front:
            print(
                f"  {p.candidate.label:32s} {p.time_per_epoch_s:10.1f} s/epoch  ${p.cost_per_epoch_usd:.4f}/epoch"
            )
    print(f"bound above every planned throughput: {str(bound_ok).lower()}; profiles {profiles_s:.1f} s")
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "advise.json").write_text(
        json.dumps(
            {
                "offers": args.offers,
                "model": args.model,
                "global_batch": args.global_batch,
                "max_gpus": args.max_gpus,
                "candidates": len(candidates),
                "evaluated": pruned.planned,
                "brute_force_evaluated": brute.planned,
                "front": [p.candidate.label for p in pruned.front],
                "same_as_brute_force": same,
                "bound_ok": bound_ok,
                "advise_seconds": [r.seconds for r in runs],
                "brute_force_seconds": brute.seconds,
                "profiles_seconds": profiles_s,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"advise: offers={len(offers.offers)} candidates={len(candidates)} evaluated={pruned.planned} "
        f"front={len(pruned.front)} same_as_brute_force={str(same).lower()} seconds={seconds:.2f}"
    )
    return 0 if same and bound_ok and pruned.planned * 10 <= len(candidates) else 1


if __name__ == "__main__":
    raise SystemExit(main())
