from gpu_bootstrap.cli.commands import main

main()
