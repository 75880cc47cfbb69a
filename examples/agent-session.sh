#!/usr/bin/env bash
# A scripted "coding agent" let loose on a small project: the kind of session aether-journal is
# for. It edits in place, rewrites, creates, deletes a build tree, renames, unpacks an archive,
# and makes a mistake (it deletes the docs). Run it under `aether-journal run`.
set -euo pipefail

echo "agent: renaming the helper module"
mv src/util.py src/helpers.py
sed -i 's/from util import/from helpers import/' src/main.py

echo "agent: bumping the version everywhere"
sed -i 's/0\.1\.0/0.2.0/' setup.cfg src/__init__.py

echo "agent: rewriting the config with python"
python3 - <<'PY'
import json
cfg = json.load(open("config.json"))
cfg["debug"] = False
cfg["retries"] = 5
with open("config.json", "w") as f:
    json.dump(cfg, f, indent=2)
PY

echo "agent: cleaning the build directory"
rm -rf build

echo "agent: vendoring a dependency"
mkdir -p vendor
tar xf deps.tar -C vendor

echo "agent: appending to the changelog"
echo "- 0.2.0: renamed util to helpers" >> CHANGELOG.md

echo "agent: oops, removing the docs it thought were stale"
rm -r docs
