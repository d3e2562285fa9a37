module github.com/epochsketch/epochsketch/sketchproxy

go 1.24

require github.com/epochsketch/epochsketch v0.0.0

require gopkg.in/yaml.v3 v3.0.1 // indirect

replace github.com/epochsketch/epochsketch => ../
