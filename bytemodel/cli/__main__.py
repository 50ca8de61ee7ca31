"""`python -m bytemodel.cli`: the same command as `bytemodel`."""
from . import main

main()
