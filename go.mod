module github.com/epochsketch/epochsketch

go 1.24
