"""Streams inference from a v2 server with Triton's own client library; prints JSON.

Run as a separate process: tritonclient registers its own copy of the ``inference``
protos, which cannot share a process with the project's generated ones.

``python triton_stream.py HOST:PORT MODEL N_FEATURES``
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import numpy as np
import tritonclient.grpc as triton


def main(target: str, model: str, n: int) -> dict[str, Any]:
    """Two good requests (1 and 4 rows) and one of the wrong shape, on one stream."""
    client = triton.InferenceServerClient(url=target)
    meta = client.get_model_metadata(model)
    input_name, output_name = meta.inputs[0].name, meta.outputs[-1].name
    results: list[dict[str, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            results.append({"error": str(error)})
        else:
            probabilities = result.as_numpy(output_name)
            results.append(
                {
                    "id": result.get_response().id,
                    "shape": list(probabilities.shape),
                    "row_sums": probabilities.sum(axis=1).tolist(),
                }
            )
        if len(results) == 3:
            done.set()

    client.start_stream(callback=callback)
    try:
        for request_id, rows, width in (("a", 1, n), ("b", 4, n), ("bad", 1, n + 1)):
            tensor = triton.InferInput(input_name, [rows, width], "FP32")
            tensor.set_data_from_numpy(np.ones((rows, width), dtype=np.float32))
            client.async_stream_infer(
                model,
                [tensor],
                request_id=request_id,
                outputs=[triton.InferRequestedOutput(output_name)],
                timeout=5_000_000,  # µs: the request's own deadline
            )
        done.wait(20)
    finally:
        client.stop_stream()
        client.close()
    return {"results": results}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
