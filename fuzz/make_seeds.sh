#!/bin/sh
# fuzz/make_seeds.sh OUTDIR — writes the seed corpus of every fuzz target into
# OUTDIR/<target>/, from the real PyTorch files in tests/data/corpus/*/ (the
# whole files, and their <root>/data.pkl members for the pickle targets).
#
# Every harness reads byte 0 as its option byte (fuzz/fuzz_util.hpp), so each
# seed is written once per option value listed below: `opt` is the byte in
# octal, as printf(1) takes it. Names: <torch-version>_<case>[.pkl]_<opt>.
#
# data.pkl extraction uses `unzip -p` (or python3's zipfile when unzip is
# missing); with neither, the pickle targets get only the bare .pkl files.
set -eu

out=${1:?usage: make_seeds.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
corpus=$here/../tests/data/corpus

# Every target gets a directory, even one with no seeds from the corpus
# (safetensors: hand-made seeds in fuzz/corpus/safetensors only).
for t in zip pickle pickle_torch load scan differential safetensors roundtrip graph bundle dcp_metadata; do
  mkdir -p "$out/$t"
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/safeckpt-seeds.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# seed TARGET NAME FILE OPT...: OUTDIR/TARGET/NAME_OPT = byte OPT + FILE.
seed() {
  target=$1 name=$2 file=$3
  shift 3
  mkdir -p "$out/$target"
  for opt in "$@"; do
    { printf "\\$opt"; cat "$file"; } >"$out/$target/${name}_$opt"
  done
}

# extract_pkl ZIPFILE DEST: writes the archive's */data.pkl to DEST.
extract_pkl() {
  if command -v unzip >/dev/null 2>&1; then
    unzip -p "$1" '*/data.pkl' >"$2" 2>/dev/null || return 1
  elif command -v python3 >/dev/null 2>&1; then
    python3 - "$1" "$2" <<'EOF' || return 1
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1)
    open(sys.argv[2], "wb").write(z.read(name))
EOF
  else
    return 1
  fi
  [ -s "$2" ]
}

n=0
for dir in "$corpus"/torch-*; do
  [ -d "$dir" ] || continue
  ver=$(basename "$dir")
  for f in "$dir"/*.pt "$dir"/*.pkl; do
    [ -f "$f" ] || continue
    case_=$(basename "$f")
    case_=${case_%.*}
    name=${ver}_$case_
    # zip: 000 plain, 001 verify_crc, 004 tiny entry/name caps.
    seed zip "$name" "$f" 000 001 004
    # load: 000 defaults, 033 verify_crc + extended allowlist + load_buffer +
    # to_json, 004 tiny limits.
    seed load "$name" "$f" 000 033 004
    # The differential, scanner and safetensors targets read whole files too
    # (they are built only when their layers exist; seeds are cheap).
    seed differential "$name" "$f" 000 001 016
    # scan: 000 defaults (nesting 0), 106 nesting 3 + reports, 030 loader off.
    seed scan "$name" "$f" 000 106 030
    # roundtrip file mode: 001 load -> save -> load, 005 alignment 1,
    # 041 legacy format (octal: bits 0 and 5).
    seed roundtrip "$name" "$f" 001 005 041
    pkl=$tmp/data.pkl
    if extract_pkl "$f" "$pkl"; then
      # pickle: 000 plain, 001 tiny limits, 004 deny calls.
      seed pickle "$name.pkl" "$pkl" 000 001 004
      # pickle_torch: 000 default allowlist, 001 extended, 020 continue mode.
      seed pickle_torch "$name.pkl" "$pkl" 000 001 020
    elif [ "${f##*.}" = pkl ] || head -c 2 "$f" | od -An -tx1 | grep -q '80'; then
      # A bare pickle or a legacy (sequential pickles) file: 200 = second
      # stream after STOP; 002 legacy pid form for the torch hooks.
      seed pickle "$name" "$f" 000 200
      seed pickle_torch "$name" "$f" 000 002
    fi
    n=$((n + 1))
  done
done
# DTensor rank files (tests/data/dcp-2.11/*/ranks, PyTorch 2.11): load 033 and pickle_torch 001
# use the extended allowlist, which holds allowlist/dtensor.allow's classes.
for f in "$here"/../tests/data/dcp-2.11/*/ranks/rank1.pt; do
  [ -f "$f" ] || continue
  name=dcp-2.11_$(basename "$(dirname "$(dirname "$f")")")_rank1
  seed load "$name" "$f" 033
  pkl=$tmp/data.pkl
  if extract_pkl "$f" "$pkl"; then
    seed pickle_torch "$name.pkl" "$pkl" 001
  fi
done
# graph: torch.export programs (tests/data/pt2-2.11): 001 = the program JSON
# (models/model.json), 005 = JSON + run on the CPU interpreter; 000/004 =
# the whole archive (the small ones; 004 = + run).
pt2=$here/../tests/data/pt2-2.11
for f in "$pt2"/*.pt2; do
  [ -f "$f" ] || continue
  stem=pt2-2.11_$(basename "$f" .pt2)
  if command -v unzip >/dev/null 2>&1 && unzip -p "$f" '*/models/model.json' >"$tmp/model.json" 2>/dev/null; then
    seed graph "$stem.json" "$tmp/model.json" 001 005
  fi
  case $stem in *mlp* | *cnn*) seed graph "$stem" "$f" 000 004 ;; esac
  # differential: valid PT2 archives, judged by the engine (the scan is clean,
  # the loader refuses with kUnsupported); replayed by ctest fuzz.differential.
  case $stem in *mlp* | *cnn.core) seed differential "$stem" "$f" 000 ;; esac
  n=$((n + 1))
done
# dcp_metadata: the .metadata pickles of tests/data/dcp-2.11 (000 = default
# limits, 001 = tiny limits); fuzz/corpus/dcp_metadata holds the same with 000.
for f in "$here"/../tests/data/dcp-2.11/*/dcp/.metadata; do
  [ -f "$f" ] || continue
  stem=dcp-2.11_$(basename "$(dirname "$(dirname "$f")")")
  seed dcp_metadata "$stem" "$f" 000 001
  n=$((n + 1))
done
echo "make_seeds: $n corpus files -> $out ($(ls "$out" | tr '\n' ' '))"
