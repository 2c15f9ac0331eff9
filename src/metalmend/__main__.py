from metalmend.cli.main import main

main()
