#!/usr/bin/env bash
# One command in this working tree and in older revisions' trees, back to back in one device call: an A/B (or a
# bisection over several revisions) of code changes on the same machine (figures compare only within a call). The
# device has no git history, so the older trees are laid out here first and carried (`.devrun/` is ignored by git;
# carry it with the call):
#
#   bash bench/rev_ab.sh --prepare REV[,REV...]             # here: git archive each REV into .devrun/rev-REV (no docs/)
#   bash bench/rev_ab.sh REV[,REV...] SECONDS -- CMD ARGS...  # on the device: CMD in this tree, then in each REV's
#
# Each run gets its own package layout (bench/link_package.sh) and SelIR cache (DETENT_CACHE_DIR=/tmp/selir-TAG),
# and at most SECONDS; `{tag}` in CMD's arguments becomes `main` or `rev-REV` (e.g. --out $OUT/{tag}), so that the
# runs write apart. The command reads the files it names in its own tree (a tuple committed before REV is REV's).
# Examples: session 45's owed Poisson A/B (the mid-M rule's parent against main), and session 52's owed bisection
# of the 0.5B batch-1 step (before and after the combine of `8eb95ee`, session 40, session 35):
#
#   bash bench/rev_ab.sh a9bd84d 250 -- python3 -P -m detent_rl.bench --arms stock,detent --stock-pdl on \
#       --rounds 2 --serves 5 --cases poisson --max-num-tokens 8192 --kernels --out "$OUT/{tag}"
#   bash bench/rev_ab.sh ed3abbe,8eb95ee,0b6a774,4b71ffe 60 -- python3 -P -m detent_rl.bench --arms stock,tuned \
#       --commitment decode-1=bench/tuned/h200_qwen2-0.5b_decode1.json --max-num-tokens 8192 --stock-pdl on \
#       --rounds 3 --cases decode-1 --out "/tmp/{tag}"
set -uo pipefail
root=$(pwd)
usage="usage: bash bench/rev_ab.sh [--prepare] REV[,REV...] [SECONDS -- CMD ARGS...]"
if [ "${1:-}" = "--prepare" ]; then
    IFS=',' read -ra revs <<< "${2:?$usage}"
    for rev in "${revs[@]}"; do
        dest="$root/.devrun/rev-$rev"
        rm -rf "$dest" && mkdir -p "$dest" || exit 1
        git -C "$root" archive "$rev" | tar -x -C "$dest" || { echo "rev_ab: git archive $rev failed" >&2; exit 1; }
        rm -rf "$dest/docs"
        echo "rev_ab: $rev laid out in .devrun/rev-$rev ($(du -sh "$dest" | cut -f1)); carry .devrun with the call"
    done
    exit 0
fi
IFS=',' read -ra revs <<< "${1:?$usage}"
limit=${2:?$usage}
[ "${3:-}" = "--" ] || { echo "rev_ab: expected -- before the command" >&2; exit 2; }
shift 3
for rev in "${revs[@]}"; do
    [ -d "$root/.devrun/rev-$rev" ] || { echo "rev_ab: no .devrun/rev-$rev: run --prepare $rev first and carry it" >&2
                                         exit 2; }
done
status=0
for tag in main "${revs[@]/#/rev-}"; do
    tree=$root
    [ "$tag" = main ] || tree="$root/.devrun/$tag"
    args=()
    for a in "$@"; do args+=("${a//\{tag\}/$tag}"); done
    echo "== rev_ab: $tag: ${args[*]}"
    (cd "$tree" && PYTHONPATH=$(bash "$root/bench/link_package.sh" .) DETENT_CACHE_DIR="/tmp/selir-$tag" \
        PYTHONUNBUFFERED=1 timeout "$limit" "${args[@]}")
    rc=$?
    [ $rc -ne 0 ] && { echo "== rev_ab: $tag exited $rc"; status=$rc; }
done
exit $status
