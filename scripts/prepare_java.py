#!/usr/bin/env python3
"""Build the Conda-style JAVA_HOME the Shop service expects from a system JDK.

    python scripts/prepare_java.py --jdk /usr/lib/jvm/java-17-openjdk-amd64 \\
        --output /var/lib/camg/java

produces ``OUTPUT/lib/jvm -> JDK`` and ``OUTPUT/bin/<tool> -> JDK/bin/<tool>``,
so ``OUTPUT/lib/jvm/lib/server/libjvm.so`` and ``OUTPUT/bin/java`` exist.
Point the Shop settings' ``java_home`` at OUTPUT. Running it again is a no-op.
Debian's JDK comes from the package openjdk-17-jdk-headless
(packaging/apt/shop.txt).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from camg.errors import CamgError  # noqa: E402
from environments.shop import javahome  # noqa: E402

DEFAULT_JDK = "/usr/lib/jvm/java-17-openjdk-amd64"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jdk", default=DEFAULT_JDK, help=f"JDK root (default {DEFAULT_JDK})")
    parser.add_argument("--output", required=True, help="the JAVA_HOME directory to create")
    args = parser.parse_args(argv)
    try:
        libjvm = javahome.build_layout(args.jdk, args.output)
        version = javahome.feature_version(args.output)
    except CamgError as exc:
        print(f"prepare_java: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"java_home": str(Path(args.output).resolve()), "libjvm": str(libjvm),
                      "java_version": version}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
