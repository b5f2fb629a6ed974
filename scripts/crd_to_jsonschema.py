"""Write a CustomResourceDefinition's schemas as the JSON schemas kubeconform reads
(`{group}/{kind}_{version}.json`, lower-case kind), converted as kubeconform's openapi2jsonschema.py does:
objects with `properties` get `additionalProperties: false` (kubectl's strictness; the root excepted, so
apiVersion, kind and metadata pass), and `x-kubernetes-int-or-string` becomes a string-or-integer.

    python scripts/crd_to_jsonschema.py CRD.yaml OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def strict(node, root: bool = False):
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string"):
            node = {k: v for k, v in node.items() if k not in ("x-kubernetes-int-or-string", "type")}
            node["oneOf"] = [{"type": "string"}, {"type": "integer"}]
        if "properties" in node and not root and "additionalProperties" not in node:
            node["additionalProperties"] = False
        return {k: strict(v) for k, v in node.items()}
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def main(crd_path: str, out_dir: str) -> None:
    crd = yaml.safe_load(Path(crd_path).read_text())
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"].lower()
    for version in crd["spec"]["versions"]:
        out = Path(out_dir) / group / f"{kind}_{version['name']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(strict(version["schema"]["openAPIV3Schema"], root=True), indent=1) + "\n")
        print(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
