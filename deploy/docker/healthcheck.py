#!/usr/bin/env python3
"""infera-healthcheck: exit 0 when GET http://127.0.0.1:$INFERA_ROUTER_PORT/health answers 200.

The router image's HEALTHCHECK (no curl in a slim image; the stdlib is enough).
Usage: infera-healthcheck [URL]   (default: http://127.0.0.1:${INFERA_ROUTER_PORT:-8000}/health;
the old INFERA_PORT still counts)
"""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = (
        sys.argv[1]
        if len(sys.argv) > 1
        else f"http://127.0.0.1:{os.environ.get('INFERA_ROUTER_PORT') or os.environ.get('INFERA_PORT', '8000')}/health"
    )
    try:
        with urllib.request.urlopen(
            url, timeout=float(os.environ.get("INFERA_HEALTHCHECK_TIMEOUT", "3"))
        ) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"infera-healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
