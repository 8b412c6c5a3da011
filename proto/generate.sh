#!/bin/sh
# Regenerates gateways/mx/pb/*_pb2.py and *_pb2.pyi from the .proto files of this folder.
# (Not a Python package here: `proto` is the import name of proto-plus, which Ray's dependencies install.)
#
# There is no system protoc: the compiler is the one bundled with grpcio-tools, installed in a
# throwaway venv (never the project's). grpcio-tools 1.84.0 bundles libprotoc 35.1, so the code it
# writes says "Protobuf Python Version: 7.35.1" and needs the protobuf runtime >= 7.35.1, < 8
# (the generated module checks this when imported). Keep the pin here and the runtime pin in
# pyproject.toml in step: a newer grpcio-tools may generate code the runtime refuses to load.
#
#   sh proto/generate.sh              # uses /tmp/mx-protoc-venv, created if missing
#   PROTOC_VENV=/elsewhere sh proto/generate.sh
set -eu

GRPCIO_TOOLS_VERSION=1.84.0
here=$(cd "$(dirname "$0")" && pwd)
venv=${PROTOC_VENV:-/tmp/mx-protoc-venv}

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -m pip show grpcio-tools 2>/dev/null | grep -qx "Version: $GRPCIO_TOOLS_VERSION"; then
  "$venv/bin/python" -m pip install --quiet "grpcio-tools==$GRPCIO_TOOLS_VERSION"
fi

cd "$here"
# -I . : the .proto files import nothing, so each generated module stands alone.
out="$here/../gateways/mx/pb"
"$venv/bin/python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" mx_hub.proto mx_node.proto
echo "generated: $(ls "$out"/*_pb2.py* | xargs -n1 basename | tr '\n' ' ')"
