from streamer.cli import console

console()
