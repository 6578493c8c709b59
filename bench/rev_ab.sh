#!/usr/bin/env bash
# One command in this working tree and in an older revision's, back to back in one device call: an A/B of a code
# change on the same machine (figures compare only within a call). The device has no git history, so the older
# tree is laid out here first and carried (`.devrun/` is ignored by git; carry it with the call):
#
#   bash bench/rev_ab.sh --prepare REV                  # here: git archive REV into .devrun/rev-REV (no docs/)
#   bash bench/rev_ab.sh REV SECONDS -- CMD ARGS...     # on the device: CMD in this tree, then in REV's
#
# Each run gets its own package layout (bench/link_package.sh) and SelIR cache (DETENT_CACHE_DIR=/tmp/selir-TAG),
# and at most SECONDS; `{tag}` in CMD's arguments becomes `main` or `rev-REV` (e.g. --out $OUT/{tag}), so that the
# two runs write apart. Example (session 45's owed Poisson A/B, the mid-M rule's parent against main):
#
#   bash bench/rev_ab.sh a9bd84d 250 -- python3 -P -m detent_rl.bench --arms stock,detent --stock-pdl on \
#       --rounds 2 --serves 5 --cases poisson --max-num-tokens 8192 --kernels --out "$OUT/{tag}"
set -uo pipefail
root=$(pwd)
if [ "${1:-}" = "--prepare" ]; then
    rev=${2:?usage: bash bench/rev_ab.sh --prepare REV}
    dest="$root/.devrun/rev-$rev"
    rm -rf "$dest" && mkdir -p "$dest" || exit 1
    git -C "$root" archive "$rev" | tar -x -C "$dest" || { echo "rev_ab: git archive $rev failed" >&2; exit 1; }
    rm -rf "$dest/docs"
    echo "rev_ab: $rev laid out in .devrun/rev-$rev ($(du -sh "$dest" | cut -f1)); carry .devrun with the call"
    exit 0
fi
rev=${1:?usage: bash bench/rev_ab.sh REV SECONDS -- CMD ARGS...}
limit=${2:?usage: bash bench/rev_ab.sh REV SECONDS -- CMD ARGS...}
[ "${3:-}" = "--" ] || { echo "rev_ab: expected -- before the command" >&2; exit 2; }
shift 3
[ -d "$root/.devrun/rev-$rev" ] || { echo "rev_ab: no .devrun/rev-$rev: run --prepare $rev first and carry it" >&2
                                     exit 2; }
status=0
for tag in main "rev-$rev"; do
    tree=$root
    [ "$tag" = main ] || tree="$root/.devrun/$tag"
    args=()
    for a in "$@"; do args+=("${a//\{tag\}/$tag}"); done
    echo "== rev_ab: $tag: ${args[*]}"
    (cd "$tree" && PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR="/tmp/selir-$tag" \
        PYTHONUNBUFFERED=1 timeout "$limit" "${args[@]}")
    rc=$?
    [ $rc -ne 0 ] && { echo "== rev_ab: $tag exited $rc"; status=$rc; }
done
exit $status
