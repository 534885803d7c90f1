from infera_core.cli import main

main()
