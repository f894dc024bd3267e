from tapegrad.cli import main

main()
