from trtq.cli import main

main()
