"""Models as every part of the mesh uses them: the repository of published versions, the
ONNX Runtime session, the v2 tensors that carry a row, and the settings that pick one."""
