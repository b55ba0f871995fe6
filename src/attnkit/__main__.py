from attnkit.cli.main import console

console()
