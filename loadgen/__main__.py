"""``python -m loadgen``."""

from loadgen.cli import entry

if __name__ == "__main__":
    entry()
