#!/usr/bin/env bash
# The crate's public items, as rustdoc pages (structs, enums, traits, functions, constants, macros,
# type aliases, statics) under `cargo doc --no-deps --all-features`, one path per line.
#   bash scripts/public_api.sh           # print the list and the count
#   bash scripts/public_api.sh --check   # fail when the list differs from scripts/public-api.txt
# A change to the public API shows up as a diff of scripts/public-api.txt in review: regenerate it
# with `bash scripts/public_api.sh > scripts/public-api.txt` when the change is meant.
# `#[doc(hidden)]` items at item level would not get a page; the crate has none outside cfg(test).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --no-deps --all-features -q >&2
list() {
  # Pages that only redirect (an item re-exported elsewhere) are not items of their own.
  (cd "$target/doc" && find tollgate -name '*.html' -exec grep -L '<title>Redirection</title>' {} + \
    | grep -E '/(struct|enum|trait|fn|constant|macro|type|static)\.[^/]+\.html$' \
    | sed -E 's#\.html$##; s#/(struct|enum|trait|fn|constant|macro|type|static)\.# \1 #' \
    | sort)
}
if [ "${1:-}" = "--check" ]; then
  if ! diff -u scripts/public-api.txt <(list); then
    echo "the public API changed: if meant, run: bash scripts/public_api.sh > scripts/public-api.txt" >&2
    exit 1
  fi
  echo "public items: $(wc -l < scripts/public-api.txt) (unchanged)" >&2
else
  list
  echo "public items: $(list | wc -l)" >&2
fi
