#!/usr/bin/env bash
# Download, here, the wheels the GPU check needs on the lent GPU machine (Python 3.12, x86-64,
# no network there) into .whl/ (git-ignored): sam-runner's runtime dependencies (pyproject.toml)
# and theirs that the machine lacks (scripts/device_packages.txt), one pinned version each, and
# nothing it already has. tests/test_gpu_wheels.py checks both lists against each other.
#
#   bash scripts/fetch_gpu_wheels.sh
#   then, on the device: carry .whl and run  python3 scripts/gpu_check.py $OUT
#
# The pins are the versions this project's tests run with. A dependency that the device has
# in an older version than one of these needs (typing-extensions for pydantic, protobuf for
# googleapis-common-protos) is not carried: gpu_check.json's env part says whether each
# carried package imports there.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl

# name==version, binary wheels for CPython 3.12 on manylinux x86-64, or pure Python
WHEELS=(
  hydra-core==1.3.8
  omegaconf==2.3.1
  hydra-submitit-launcher==1.2.0
  submitit==1.5.4
  mnist1d==0.0.2.post1
  wandb==0.31.0
  cwevals==0.0.1b1
  distro==1.9.0
  sniffio==1.3.1
  platformdirs==4.14.9
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  googleapis-common-protos==1.76.0
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
  opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2
  optuna==5.1.0
  alembic==1.20.1
  mako==1.4.3
  sqlalchemy==2.1.9
  colorlog==6.12.0
)
# published as source only (omegaconf pins 4.9.*): built here into a pure-Python wheel
SDISTS=(
  antlr4-python3-runtime==4.9.3
)

rm -rf "$DEST"
mkdir -p "$DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
python3 -m pip wheel --quiet --no-deps -w "$DEST" "${SDISTS[@]}"

# every file a wheel the device can install: pure Python or CPython 3.12 on x86-64
bad=$(find "$DEST" -type f ! -name '*-none-any.whl' ! -name '*-py3-none-manylinux*x86_64.whl' \
  ! -name '*-cp312-cp312-manylinux*x86_64.whl' -printf '%f\n')
if [ -n "$bad" ]; then
  echo "fetch_gpu_wheels: not for Python 3.12 x86-64: $bad" >&2
  exit 1
fi
count=$(find "$DEST" -type f -name '*.whl' | wc -l)
want=$(( ${#WHEELS[@]} + ${#SDISTS[@]} ))
if [ "$count" -ne "$want" ]; then
  echo "fetch_gpu_wheels: $count wheels for $want pins" >&2
  exit 1
fi
echo "$count wheels, $(du -sh "$DEST" | cut -f1) in $DEST/ (the working tree that travels: at most 64 MiB)"
