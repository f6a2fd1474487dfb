"""``python -m gpualloc``: the same entry point as the ``gpualloc`` console script."""

from gpualloc.cli.main import run

if __name__ == "__main__":
    run()
