"""`python -m xenith_edu`: the same command line as `xenith-edu`.

See xenith_edu.cli for the subcommands.
"""

from .cli import main

raise SystemExit(main())
