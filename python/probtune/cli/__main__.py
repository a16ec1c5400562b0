"""``python -m probtune.cli``: the ``probtune`` command."""

import sys

from probtune.cli.commands import main

sys.exit(main())
