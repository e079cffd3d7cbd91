#!/usr/bin/env bash
# Re-cut a payload of ../shared/tools/vllm-offline/build-payload.sh into smaller chunks, so that one chunk plus this
# checkout fits one device call (64 MiB in all): the same site.tar.xz (its SHA256 is checked), parts of SIZE.
#   bash benchmarks/e2e/resplit-payload.sh [DIR] [SIZE]      (default .vllm-payload, 54M; at most 10 parts, as
#                                                             unpack.sh orders part0 … part9 by its glob)
set -euo pipefail
DIR=${1:-.vllm-payload}; SIZE=${2:-54M}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
last=$(cd "$(ls -d "$DIR"/c* | sort -V | tail -1)" && pwd)
cat $(ls "$DIR"/c*/site.tar.xz.part* | sort -V) > "$work/site.tar.xz"
(cd "$work" && sha256sum -c "$last/SHA256")
cp -r "$last/SHA256" "$last/unpack.sh" "$last/models" "$work/"
split -b "$SIZE" -d -a 1 "$work/site.tar.xz" "$work/site.tar.xz.part"
rm -rf "$DIR"; n=0
for part in "$work"/site.tar.xz.part*; do mkdir -p "$DIR/c$n"; mv "$part" "$DIR/c$n/"; last=$n; n=$((n + 1)); done
cp -r "$work/SHA256" "$work/unpack.sh" "$work/models" "$DIR/c$last/"
du -sh "$DIR"/c*; echo "payload re-cut into $n chunks of at most $SIZE"
