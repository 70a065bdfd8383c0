#!/bin/sh
# Regenerates podresources_pb2.py / podresources_pb2_grpc.py (committed, so the image
# needs no protoc). Run from anywhere; needs grpcio-tools (pip install grpcio-tools).
# The proto is compiled with the repository root as include path so the generated
# grpc module imports "nodeagent.proto.podresources_pb2" rather than a top-level name.
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
    nodeagent/proto/podresources.proto
