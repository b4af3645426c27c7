#!/bin/sh
# Writes the inputs of check_to_dcp.py with this build's CLI:
#   tests/gen/make_to_dcp.sh SAFECKPT WORK
# For every tests/data/dcp-2.11 case: `safeckpt convert CASE/dcp --to-dcp WORK/CASE/dcp`
# (PyTorch's sharded directory, consolidated, written back with world size 1) beside the
# case's references (full.safetensors, expected.json); for a few tests/data/corpus/torch-2.11
# files: `safeckpt convert FILE --to-dcp WORK/NAME/dcp` beside the file (source.pt).
# The same again as 3 writers (`--world-size 3`: every tensor Shard(0) over 3 ranks) into
# WORK/<name>-ws3/dcp, which check_to_dcp.py loads into DTensors of 2 and 4 ranks.
set -eu
cli=$1
work=$2
here=$(cd "$(dirname "$0")/../data" && pwd)
mkdir -p "$work"
for d in "$here"/dcp-2.11/*/; do
  name=$(basename "$d")
  mkdir -p "$work/$name"
  cp "$d/full.safetensors" "$d/expected.json" "$work/$name/"
  "$cli" convert "$d/dcp" --to-dcp "$work/$name/dcp"
  mkdir -p "$work/$name-ws3"
  cp "$d/full.safetensors" "$d/expected.json" "$work/$name-ws3/"
  "$cli" convert "$d/dcp" --to-dcp "$work/$name-ws3/dcp" --world-size 3
done
for f in mlp_state_dict training_checkpoint views_shared_storage scalars_and_empty all_dtypes; do
  mkdir -p "$work/corpus-$f"
  cp "$here/corpus/torch-2.11/$f.pt" "$work/corpus-$f/source.pt"
  "$cli" convert "$work/corpus-$f/source.pt" --to-dcp "$work/corpus-$f/dcp" || rm -rf "$work/corpus-$f"
  mkdir -p "$work/corpus-$f-ws3"
  cp "$here/corpus/torch-2.11/$f.pt" "$work/corpus-$f-ws3/source.pt"
  "$cli" convert "$work/corpus-$f-ws3/source.pt" --to-dcp "$work/corpus-$f-ws3/dcp" --world-size 3 ||
    rm -rf "$work/corpus-$f-ws3"
done
