import sys

from .server import serve

sys.exit(serve())
