"""The top floor: the `xenith-edu` command line (train, sample, gradcheck, student, grade).
Each command parses its arguments here and calls the floors below; errors become one line.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
