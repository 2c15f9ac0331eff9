from metalmend.cli import main

main()
