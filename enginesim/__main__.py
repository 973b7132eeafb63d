"""`python -m enginesim sglang <flags>` or `python -m enginesim vllm serve <model> <flags>`."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
