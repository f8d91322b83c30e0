#!/usr/bin/env bash
# Fails when docs/env.md is not what `squall_info --params-md` generates.
set -euo pipefail
info=$1
doc=$2
if ! diff -u "$doc" <("$info" --params-md); then
  echo "docs/env.md is stale: regenerate it with: build/tools/squall_info --params-md > docs/env.md" >&2
  exit 1
fi
echo "docs/env.md matches src/common/params.def"
