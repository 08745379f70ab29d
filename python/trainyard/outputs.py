"""Reading an inference job's output folder (docs/OUTPUT_FORMAT.md)."""
import json
import os


def read_outputs(output_dir):
    """The outputs of a finished inference job as {name: numpy array}, every
    shard's rows concatenated in row order (numpy is imported here, so the
    rest of the client does not need it).

    Raises ValueError when the folder's manifest.json is missing, not a
    trainyard-outputs-v1 manifest, or not complete (the job has not
    finished), and when a shard's rows disagree with it.
    """
    import numpy as np

    path = os.path.join(output_dir, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if manifest.get("format") != "trainyard-outputs-v1":
        raise ValueError(f"{path}: not a trainyard-outputs-v1 manifest")
    if not manifest.get("complete"):
        raise ValueError(f"{path}: the job's outputs are not complete yet")
    outputs = {}
    for name in manifest.get("outputs", {}):
        parts = []
        for shard in manifest["shards"]:
            a = np.load(os.path.join(output_dir, shard["files"][name]))
            first, end = shard["rows"]
            if a.shape[0] != end - first:
                raise ValueError(f"{output_dir}: {shard['files'][name]} has "
                                 f"{a.shape[0]} rows, the manifest says {end - first}")
            parts.append(a)
        outputs[name] = np.concatenate(parts) if parts else np.zeros((0,))
    return outputs
