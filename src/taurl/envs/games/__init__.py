"""Games with several roles and a verifier: tic-tac-toe (`taurl.envs.games.tictactoe`)."""
